# `cmake --install build [--prefix P] [--strip]`: the runtime layout (what `make image` puts under
# /usr/local of the image, scripts/image.sh): the programs in P/bin, the Python package (with
# libtrellis built into its module) and trellis-python from worker-lib/python, the job examples
# in P/share/trellis/examples. Tests, benchmarks and the static libraries are not installed.
foreach(program trellis-operator trellis-scheduler trellis-agent trellis-pserver trellis-launch trellis-mlp)
  if(TARGET ${program})
    install(TARGETS ${program} RUNTIME DESTINATION bin COMPONENT runtime)
  endif()
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/examples/mlp.yaml ${PROJECT_SOURCE_DIR}/examples/pytorch.yaml
        DESTINATION share/trellis/examples COMPONENT runtime)
install(FILES ${PROJECT_SOURCE_DIR}/examples/pytorch/train_cnn.py
        DESTINATION share/trellis/examples/pytorch COMPONENT runtime)
