//! Starlark scenario files to the scenario IR, with validation and bounded evaluation
