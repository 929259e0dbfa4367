"""The vault: a versioned keyring and envelope encryption of every secret read back."""
