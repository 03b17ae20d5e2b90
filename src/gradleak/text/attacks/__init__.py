"""The text attacks, one module each: every module opens with its ``SPEC`` (``"modality": "text"``;
gradleak/specs.py reads it without importing the module) and ends with ``run(config, update,
model, engine)``. The science they compose (the bag of words, the text simulator, the relaxations,
the order search) is in text/inversion.py; their typed configs come from text/configs.py."""
