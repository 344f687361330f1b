#include "models/recipe.h"

#include "models/arch/recipes.h"

namespace tandem::models {

const recipe& recipe_for(const model_config& c) {
  switch (c.arch) {
    case architecture::llama:
    case architecture::qwen2:
    case architecture::qwen3:
      return k_llama_recipe;
  }
  return k_llama_recipe;  // unreachable: model_config refuses other architectures
}

}  // namespace tandem::models
