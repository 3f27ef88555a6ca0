"""The table modality: rows of a CSV or Parquet file (or a built-in table), parsed by the contract, encoded,
baselined with scikit-learn, served as raw JSON rows and watched column by column."""
