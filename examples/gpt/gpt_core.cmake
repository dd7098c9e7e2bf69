# zoe_gpt_core: the trainer's model, tokenizer and data code, without the engine, so that
# tests/gpt can test it on its own. Included by examples/gpt and tests/gpt (once).
include_guard(GLOBAL)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)
find_package(nlohmann_json 3 REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
# oneDNN (Debian's libdnnl-dev): the lm_head's matmuls, fp32 and bf16 (lm_head.hpp).
find_package(dnnl REQUIRED)
# OpenSSL's libcrypto (Debian's libssl-dev): SHA-256 of the data files (sha256.hpp).
find_package(OpenSSL REQUIRED COMPONENTS Crypto)

set(_gpt ${PROJECT_SOURCE_DIR}/examples/gpt)
add_library(zoe_gpt_core STATIC
  ${_gpt}/unicode.cpp ${_gpt}/pretokenize.cpp ${_gpt}/tokenizer.cpp ${_gpt}/dataset.cpp ${_gpt}/sha256.cpp
  ${_gpt}/model_spec.cpp ${_gpt}/lm_head.cpp)
target_include_directories(zoe_gpt_core PUBLIC ${PROJECT_SOURCE_DIR})
target_compile_options(zoe_gpt_core PRIVATE -Wall -Wextra -Wno-unused-parameter)
# The trainer sees zoe through its public headers only (include/zoe, zoe::zoe).
target_link_libraries(zoe_gpt_core PUBLIC zoe::zoe Eigen3::Eigen nlohmann_json::nlohmann_json
  OpenMP::OpenMP_CXX Threads::Threads DNNL::dnnl PRIVATE OpenSSL::Crypto)

# Eigen's GEMM is the trainer's hot loop: build it for this CPU (AVX2/AVX-512, FMA) unless
# ZOE_GPT_NATIVE=OFF (for binaries that must run on other machines). PUBLIC, so every
# translation unit instantiating the ops templates agrees.
option(ZOE_GPT_NATIVE "Build the GPT trainer with -march=native" ON)
include(CheckCXXCompilerFlag)
check_cxx_compiler_flag(-march=native ZOE_GPT_HAS_MARCH_NATIVE)
if(ZOE_GPT_NATIVE AND ZOE_GPT_HAS_MARCH_NATIVE)
  target_compile_options(zoe_gpt_core PUBLIC -march=native)
endif()
# GCC 12 reports Eigen's AVX-512 packet math (_mm512_undefined_ps in avx512fintrin.h) as "may be
# used uninitialized": a known false positive that would bury real warnings in the job's output.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  target_compile_options(zoe_gpt_core PUBLIC -Wno-maybe-uninitialized)
endif()

# zoe_gpt_trainer: the training loop on zoe's Engine (src/core must exist).
if(TARGET zoe_core)
  find_package(CLI11 REQUIRED)
  add_library(zoe_gpt_trainer STATIC ${_gpt}/options.cpp ${_gpt}/trainer.cpp ${_gpt}/metrics.cpp ${_gpt}/checkpoint.cpp
    ${_gpt}/data_layout.cpp
    ${_gpt}/progress.cpp ${_gpt}/hf_weights.cpp)
  target_compile_options(zoe_gpt_trainer PRIVATE -Wall -Wextra -Wno-unused-parameter)
  target_link_libraries(zoe_gpt_trainer PUBLIC zoe_gpt_core CLI11::CLI11)
endif()

# The CUDA backend (CudaOps), when zoe has CUDA.
include(${_gpt}/gpt_cuda.cmake)
