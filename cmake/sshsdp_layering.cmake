# The layering of sshsdp — the one statement of it, enforced by the build.
#
# SSHSDP_DEPS_<layer>: the layers <layer> builds on directly; it may use them and, through
# them, everything below (the transitive closure). A layer's library sources (everything but
# *_test.cc, *_bench.cc and testing/) may include headers of, and its library may link, only
# those layers. Tests and benchmarks may also use the reference models (models/) as fixtures.
#
#   base <- numerics <- layout  <- comm <-------------------------+
#                    <- kernels <- backend (CPU, CUDA) <- update <- engine <- ckpt <- cli
#                               <- params <- update                 ^
#                                  params, backend <- models -------|-------------- cli
#                               comm, backend <- device (staged, NCCL, direct) <- engine
#   base <- text (tokenizers) <------------------------------------------------------- cli
#   ckpt, models <- trainer (the front door: trainer.h, sshsdp/sshsdp.h)
#   ckpt, models <- hf (Hugging Face config.json and safetensors checkpoints) <----------- cli
# (params/model.h is the Model interface the engine runs; models/ implements it and does not
# depend on the engine.)
#
# Checked twice: at configure time (sshsdp_check_layering, links and includes) and by the
# ctest entry layering_test (includes, so a new #include is caught without re-configuring):
#   cmake -DSSHSDP_SOURCE_DIR=<repo> -P cmake/sshsdp_layering.cmake

if(CMAKE_SCRIPT_MODE_FILE)
  cmake_minimum_required(VERSION 3.25)  # policies when run with -P
endif()

set(SSHSDP_LAYERS base numerics layout comm kernels backend params update device engine models
    text ckpt trainer hf cli)
set(SSHSDP_DEPS_base "")
set(SSHSDP_DEPS_numerics base)
set(SSHSDP_DEPS_layout numerics)
set(SSHSDP_DEPS_kernels numerics)
set(SSHSDP_DEPS_comm layout)
set(SSHSDP_DEPS_backend kernels)
set(SSHSDP_DEPS_params kernels layout)
set(SSHSDP_DEPS_update params comm backend)
set(SSHSDP_DEPS_device backend comm)
set(SSHSDP_DEPS_engine update device)
set(SSHSDP_DEPS_models params backend)
set(SSHSDP_DEPS_ckpt engine)
set(SSHSDP_DEPS_text base)
set(SSHSDP_DEPS_trainer ckpt models)
set(SSHSDP_DEPS_hf ckpt models)
set(SSHSDP_DEPS_cli ckpt models text hf)

# out: the layers `layer` may use (itself included).
function(sshsdp_layer_closure layer out)
  set(todo ${layer})
  set(seen "")
  while(todo)
    list(POP_FRONT todo l)
    if(NOT l IN_LIST seen)
      list(APPEND seen ${l})
      list(APPEND todo ${SSHSDP_DEPS_${l}})
    endif()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

# Every library source of every layer includes only layers it may use; FATAL_ERROR naming
# the file, the included header and the allowed layers otherwise.
function(sshsdp_check_includes source_dir)
  set(errors "")
  foreach(layer ${SSHSDP_LAYERS})
    sshsdp_layer_closure(${layer} allowed)
    file(GLOB files ${source_dir}/sshsdp/${layer}/*.h ${source_dir}/sshsdp/${layer}/*.cc
         ${source_dir}/sshsdp/${layer}/*.cu)
    list(FILTER files EXCLUDE REGEX "_(test|bench)\\.cc$")
    foreach(f ${files})
      file(STRINGS ${f} lines REGEX "^#include \"sshsdp/[a-z]+/")
      foreach(line ${lines})
        string(REGEX REPLACE "^#include \"sshsdp/([a-z]+)/.*" "\\1" used "${line}")
        if(NOT used IN_LIST allowed)
          file(RELATIVE_PATH rel ${source_dir} ${f})
          string(JOIN ", " a ${allowed})
          string(APPEND errors "\n  ${rel}: ${line} — layer '${layer}' may use only: ${a}")
        endif()
      endforeach()
    endforeach()
  endforeach()
  if(errors)
    message(FATAL_ERROR "layering violated (cmake/sshsdp_layering.cmake):${errors}\n"
                        "Move the code to a layer that may use it, or change SSHSDP_DEPS_* "
                        "there if the design changed.")
  endif()
endfunction()

# Every layer library links only sshsdp libraries of layers it may use.
function(sshsdp_check_links)
  foreach(layer ${SSHSDP_LAYERS})
    sshsdp_layer_closure(${layer} allowed)
    get_target_property(libs sshsdp_${layer} LINK_LIBRARIES)
    get_target_property(ilibs sshsdp_${layer} INTERFACE_LINK_LIBRARIES)
    foreach(lib ${libs} ${ilibs})
      if(lib MATCHES "^sshsdp_([a-z]+)$" AND NOT CMAKE_MATCH_1 IN_LIST allowed)
        string(JOIN ", " a ${allowed})
        message(FATAL_ERROR "layering violated: sshsdp_${layer} links ${lib}; layer '${layer}' "
                            "may use only: ${a} (cmake/sshsdp_layering.cmake)")
      endif()
    endforeach()
  endforeach()
endfunction()

if(CMAKE_SCRIPT_MODE_FILE)  # cmake -P: the ctest entry
  sshsdp_check_includes(${SSHSDP_SOURCE_DIR})
  message(STATUS "layering: every layer includes only the layers below it")
endif()
