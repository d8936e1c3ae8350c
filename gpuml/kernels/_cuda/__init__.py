"""CUDA C sources (``*.cu``, shipped as package data) and the one loader that compiles them."""
