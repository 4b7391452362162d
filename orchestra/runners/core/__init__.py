"""The runner core: the backend contract, the one scheduling loop, and what backends share."""
