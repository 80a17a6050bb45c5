# -DTRELLIS_SANITIZE=address|thread|undefined builds everything with that sanitizer.
if(TRELLIS_SANITIZE)
  if(NOT TRELLIS_SANITIZE MATCHES "^(address|thread|undefined)$")
    message(FATAL_ERROR "TRELLIS_SANITIZE must be address, thread or undefined, got '${TRELLIS_SANITIZE}'")
  endif()
  add_compile_options(-fsanitize=${TRELLIS_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${TRELLIS_SANITIZE})
endif()
