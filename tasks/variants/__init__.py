"""Model variants: exporters, runners, quantisation and the parity gate, shared by export, compress and profile."""
