"""What a run cost: prices (``money``) and the ledger derived from the plan's stages
(``ledger``). Below the runner, which prices every run; above the dataset it reads."""
