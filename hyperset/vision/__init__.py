"""Vision side of Hyper-SET: classification data (``data``), image-quality metrics (``metrics``) and the
masked-image-modeling models. Import submodules explicitly: ``from hyperset.vision import data``."""
