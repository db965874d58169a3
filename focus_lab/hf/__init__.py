"""The transformers integration: attach / detach, the registered "focus" attention function, the named hook points, model loading, the shipped router files, tiny test models. Imports method/."""
