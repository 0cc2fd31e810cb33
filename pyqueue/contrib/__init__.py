"""Integrations with other libraries, each imported only by the code that uses it:
``import pyqueue`` loads none of them (nor the libraries they need)."""
