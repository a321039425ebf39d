"""Result tables, exports (Megatron-LM / NeMo / YAML) and run folders."""
