# TANDEM_SANITIZE builds everything with ASan + UBSan; UBSan findings abort so tests fail on them.
# The flags are g++ flags: they go to C/C++ compiles and to the host link only, never to nvcc
# (which rejects them) when the CUDA backend is built; CUDA objects are linked in unsanitized.
# Each sanitizer is its own flag because generator expressions split their content at commas.
if(TANDEM_SANITIZE)
  add_compile_options(
    "$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=address;-fsanitize=undefined;-fno-omit-frame-pointer;-fno-sanitize-recover=undefined>")
  add_link_options("$<HOST_LINK:-fsanitize=address;-fsanitize=undefined>")
endif()
