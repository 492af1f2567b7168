# Writes the OpenCL C files SRC (a |-separated list) into the header OUT as one string constant,
# td_opencl_source, in the order given: the opencl backend builds it at run time.
string(REPLACE "|" ";" SRC "${SRC}")  # CMakeLists.txt joins the list with |
list(SORT SRC)
set(body "")
foreach(f ${SRC})
  file(READ ${f} text)
  get_filename_component(name ${f} NAME)
  set(body "${body}// ---- ${name}\n${text}\n")
endforeach()
string(LENGTH "${body}" n)
# Raw string literal chunks keep the source readable and under compilers' literal limits.
set(out "// Generated from src/backend/opencl/*.cl by cmake/embed_cl.cmake: do not edit.\nstatic const char *const td_opencl_source[] = {\n")
set(pos 0)
while(pos LESS n)
  string(SUBSTRING "${body}" ${pos} 8000 chunk)
  string(REPLACE "\\" "\\\\" chunk "${chunk}")
  string(REPLACE "\"" "\\\"" chunk "${chunk}")
  string(REPLACE "\n" "\\n\"\n\"" chunk "${chunk}")
  set(out "${out}\"${chunk}\",\n")
  math(EXPR pos "${pos} + 8000")
endwhile()
set(out "${out}};\n")
file(WRITE ${OUT} "${out}")
