"""mmca's synthetic experiment: latent-factor prompts (Secs. 3-7, App. H); public names in :mod:`lit_icl.mmca`."""
