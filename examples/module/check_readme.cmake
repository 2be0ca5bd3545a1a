# cmake -DREADME=... -DPROGRAM=... -P check_readme.cmake: fails unless the
# README shows PROGRAM's text exactly (the README's client program is the
# one CI compiles).
file(READ "${README}" readme)
file(READ "${PROGRAM}" program)
string(FIND "${readme}" "${program}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${README} does not show ${PROGRAM} as it is: copy the file into its section")
endif()
