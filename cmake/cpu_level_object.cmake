# Links one CPU level's kernel objects into OUTPUT (CMakeLists.txt says why):
#   ld -r                 the level's objects into one, sharing one copy of each inline function
#   objcopy -R .group     dissolves the COMDAT groups, so that the final link cannot swap a
#                         level's copy of an inline function for another object's
#   objcopy -G KEEP       makes every defined symbol but the level's kernel table local
# and, with CHECK_INIT, refuses an object that would run code at start-up (static
# constructors): a level's code may run only once the CPU is known to have the level.
# Arguments (-D): LD, OBJCOPY, READELF, KEEP, OUTPUT, CHECK_INIT, OBJECTS (joined by "|").
string(REPLACE "|" ";" objects "${OBJECTS}")
set(partial "${OUTPUT}.partial.o")
execute_process(COMMAND "${LD}" -r -o "${partial}" ${objects} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ld -r of the ${KEEP} objects failed")
endif()
execute_process(COMMAND "${OBJCOPY}" -R .group "--keep-global-symbol=${KEEP}" "${partial}" "${OUTPUT}"
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "objcopy of ${partial} failed")
endif()
file(REMOVE "${partial}")
if(CHECK_INIT)
  execute_process(COMMAND "${READELF}" -S -W "${OUTPUT}" OUTPUT_VARIABLE sections RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "readelf -S ${OUTPUT} failed")
  endif()
  if(sections MATCHES "\\.(init_array|ctors|preinit_array)")
    file(REMOVE "${OUTPUT}")
    message(FATAL_ERROR "${OUTPUT}: the ${KEEP} kernels have static constructors, which would run their "
                        "instructions at start-up on any CPU; make the namespace-scope objects constexpr "
                        "or function-local")
  endif()
endif()
