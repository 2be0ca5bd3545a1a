/*
 * chimaera/device_diag.h -- what the words at chi_dev_ctx_layout_t.diag
 * (CHI_DEV_DIAG_WORDS, pinned host memory) hold: the state the orchestrator
 * kernel and the runtime's lease thread leave there for each other, for the
 * watchdogs, the tests and chimaera-bench's notes on its GPU rows.
 *
 * Internal, as device_protocol.h is: no function of the API takes or returns
 * these words.  It is installed because the device code that reads and
 * writes them is header-only (chimaera/device_protocol.h and
 * chimaera/device_orchestrator.h, compiled into a user's orchestrator), and
 * some of them carry the lease protocol (a waiting submit reads
 * CHI_DIAG_LEASE_PHASE, the lease thread CHI_DIAG_BELL and CHI_DIAG_START_*),
 * so a change here bumps CHI_DEV_ABI_VERSION (chimaera/device_layout.h).
 * Plain C, so that host readers in C use it too.
 */
#ifndef CHIMAERA_DEVICE_DIAG_H
#define CHIMAERA_DEVICE_DIAG_H

/* Words of chi_dev_ctx_layout_t.diag (plain stores by one writer each; a
 * reader sees each word whole, not the words as one snapshot).  Device
 * times are the GPU's global timer, host times CLOCK_REALTIME, both in ns;
 * the two clocks differ (by 563-725 us, drifting, on an H200): compare
 * device times with device times. */
#define CHI_DIAG_KEEP_AT 0u      /* keeper: time of its last look past the lease */
#define CHI_DIAG_KEEP_EPOCH 1u   /* keeper: its launch's index */
#define CHI_DIAG_KEEP_HOST 2u    /* keeper: host_lease[0] << 32 | host_lease[1] (low 32 bits each) */
#define CHI_DIAG_KEEP_QUIET 3u   /* keeper: ns since the device routes last changed */
#define CHI_DIAG_KEEP_STATE 4u   /* keeper: in_use | branch << 8 (CHI_DIAG_BRANCH_*) | leave << 16 */
#define CHI_DIAG_START_EPOCH 5u  /* the newest launch's index ... */
#define CHI_DIAG_START_AT 6u     /* ... and when it started */
#define CHI_DIAG_END 7u          /* the last launch to end: index << 8 | why (CHI_DIAG_END_*) */
#define CHI_DIAG_END_AT 8u
#define CHI_DIAG_BELL 9u         /* keeper: the bell value it rang for (host_lease[2]) */
#define CHI_DIAG_BELL_AT 10u     /* ... and when */
#define CHI_DIAG_ASIDE_N 11u     /* keeper: launches that stepped aside so far (since ABI 9) */
#define CHI_DIAG_ASIDE_AT 12u    /* ... when the last one did */
#define CHI_DIAG_ASIDE_WHY 13u   /* ... and why: bell (1: the pollers' bell) | in_use << 1 |
                                  * the routes' quiet time in us << 32 */
#define CHI_DIAG_ASIDE_BELL 14u  /* keeper: of ASIDE_N, those the pollers' bell made */
#define CHI_DIAG_ASIDE_IN_USE 15u /* keeper: of ASIDE_N, those with slots in use */
#define CHI_DIAG_LEASE_PHASE 16u /* lease thread: CHI_DIAG_PHASE_* */
#define CHI_DIAG_LEASE_AT 17u    /* ... since when (host) */
#define CHI_DIAG_LEASE_N 18u     /* ... the launch it looks after */
#define CHI_DIAG_LAUNCH_NS 20u   /* keeper: ns its launches ran, summed ... (16-byte aligned:
                                  * read and written with LAUNCH_N as one pair) */
#define CHI_DIAG_LAUNCH_N 21u    /* ... over this many launches (keepers' own clock) */
#define CHI_DIAG_GATE_GAVE_UP_AT 22u /* the last GPU->GPU submit that gave up at the closed gate
                                     * (CHI_ERR_AGAIN; any submitter writes it): when ... */
#define CHI_DIAG_GATE_GAVE_UP_WHY 23u /* ... the lease thread's phase it saw last (0: no diag) |
                                       * 1 << 8 if the submit timeout ended it | waited us << 32 */
#define CHI_DIAG_BRANCH_QUEUED 1u /* the successor is queued */
#define CHI_DIAG_BRANCH_TRYING 2u /* the successor is being queued (maybe held back) */
#define CHI_DIAG_BRANCH_LATE 3u   /* neither */
#define CHI_DIAG_END_STOP 1u      /* stop flag (pause, shutdown) */
#define CHI_DIAG_END_LEASE 2u     /* lease over (the keeper's decision) */
#define CHI_DIAG_END_BELL 3u      /* ended early to wake parked GPU->CPU pollers */
#define CHI_DIAG_PHASE_IDLE 1u    /* waiting for the orchestrator to run */
#define CHI_DIAG_PHASE_SLEEP 2u   /* until shortly before the lease ends */
#define CHI_DIAG_PHASE_QUEUE 3u   /* queuing the successor (a CUDA launch) */
#define CHI_DIAG_PHASE_WAIT_END 4u /* waiting for the running launch to end (the bell thread wakes it) */
#define CHI_DIAG_PHASE_LOCK 5u    /* taking the device's lock */
#define CHI_DIAG_PHASE_QUERY 6u   /* asking CUDA whether the running launch ended (SLEEP or WAIT_END
                                   * otherwise; a device-wide call may hold this one) */
/* Names of the phases, by value, for diagnostics: const char *const n[] = CHI_DIAG_PHASE_NAMES; */
#define CHI_DIAG_PHASE_NAMES {"?", "idle", "sleep", "queue", "wait-end", "lock", "query"}
#define CHI_DIAG_PHASE_COUNT 7u

#endif /* CHIMAERA_DEVICE_DIAG_H */
