// The recipes of models/arch/, one file each; recipe_for (models/recipe.cpp) maps an
// architecture to its recipe.
#pragma once

#include "models/recipe.h"

namespace tandem::models {

extern const recipe k_llama_recipe;  // llama, qwen2, qwen3 (arch/llama.cpp)

}  // namespace tandem::models
