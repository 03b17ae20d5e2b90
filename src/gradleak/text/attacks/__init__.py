"""The text attacks, one module each: every module opens with its ``SPEC`` (``"modality": "text"``;
gradleak/specs.py reads it without importing the module) and ends with ``run(config, update,
model, engine)``. The science they compose is in text/: the bag of words (leak.py), the text simulator
(simulate.py), the relaxations (search.py), the order search (order.py); their typed configs come
from text/configs.py."""
