# Decides whether the Fortran module is built (CHI_FORTRAN: AUTO, ON, OFF) and
# enables Fortran in the including directory.  Sets CHI_HAVE_FORTRAN.
# Included by bindings/fortran and examples/fortran, so both decide alike.
include(CheckLanguage)
set(CHI_HAVE_FORTRAN 0)
if(NOT CHI_FORTRAN STREQUAL "OFF")
  check_language(Fortran)
  if(CMAKE_Fortran_COMPILER)
    enable_language(Fortran)
    set(CHI_HAVE_FORTRAN 1)
  elseif(CHI_FORTRAN STREQUAL "ON")
    message(FATAL_ERROR "CHI_FORTRAN=ON but no Fortran compiler was found")
  endif()
endif()
