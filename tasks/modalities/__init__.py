"""One package per kind of data (table, image, text), each behind the same interface: the steps never ask which."""
