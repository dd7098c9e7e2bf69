// The engine's checkpoint and export calls, over StateAccess (state_access.hpp): the public
// Engine::save_checkpoint, load_checkpoint and export_safetensors (engine.cpp) run these inside
// their error boundary. They see the engine only through StateAccess.
// Not thread-safe: the thread that drives the Engine calls them, on every rank together.
#pragma once

#include <map>
#include <string>

#include "zoe/dtype.hpp"

namespace zoe::core {

class StateAccess;

/// Engine::save_checkpoint (see zoe/engine.hpp for the contract and the errors).
void save_engine_checkpoint(StateAccess& S, const std::string& dir, const std::string& client_state);
/// Engine::load_checkpoint; returns the saved client state.
std::string load_engine_checkpoint(StateAccess& S, const std::string& dir);
/// Engine::export_safetensors.
void export_engine_safetensors(StateAccess& S, const std::string& path, DType dtype,
                               const std::map<std::string, std::string>& metadata);

}  // namespace zoe::core
