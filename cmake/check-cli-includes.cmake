# Fails when a file of the kiln command includes a header of its own other
# than cli.h, or one of the library's other than the public kiln.h: the
# command is a program built on the public API, like any other.
#
#   cmake -DDIR=cli -P check-cli-includes.cmake
cmake_minimum_required(VERSION 3.20)

if(NOT DIR)
  message(FATAL_ERROR "check-cli-includes.cmake: set DIR")
endif()

file(GLOB files "${DIR}/*.c" "${DIR}/*.h")
if(NOT files)
  message(FATAL_ERROR "${DIR} holds no .c or .h file")
endif()
set(problems "")
foreach(f IN LISTS files)
  file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]*)\".*$" "\\1" header "${line}")
    if(NOT header MATCHES "^(cli|kiln)\\.h$")
      string(APPEND problems "\n  ${f}: #include \"${header}\"")
    endif()
  endforeach()
endforeach()
if(problems)
  message(FATAL_ERROR "the kiln command may include only \"cli.h\", \"kiln.h\" and system "
                      "headers:${problems}")
endif()
list(LENGTH files n)
message(STATUS "${DIR}: ${n} files include only cli.h, kiln.h and system headers")
