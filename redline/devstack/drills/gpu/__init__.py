"""The `gpu-node-failure` drill: a GPU node failure, cold against warm recovery."""
