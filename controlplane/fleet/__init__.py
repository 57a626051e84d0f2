"""The fleet's request path as the control plane serves it to routers."""
