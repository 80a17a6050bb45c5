# Warnings on for our own targets (call trellis_warnings(target)).
function(trellis_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter)
  if(TRELLIS_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
