"""The text modality: texts read, checked, tokenized (the tokenizer is an artifact of the run and lives inside the
served graph), baselined and watched."""
