"""distify's bundled rule packs (YAML data, loaded by :mod:`distify.rules`)."""
