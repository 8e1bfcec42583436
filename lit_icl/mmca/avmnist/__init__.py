"""mmca's corrupted-avMNIST experiment (Sec. 7, Table 1, App. I); public names in :mod:`lit_icl.mmca`."""
