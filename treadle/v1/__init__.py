"""Generated gRPC stubs; edit proto/treadle/v1 and run `make proto`."""
