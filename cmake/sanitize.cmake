# TANDEM_SANITIZE builds everything with ASan + UBSan; UBSan findings abort so tests fail on them.
if(TANDEM_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
