"""The live state and what changes it, in rooms by what changes together (docs/architecture.md,
"The control plane's rooms"): ``loops`` (on a timer) above ``routing`` (a request's lease and
its tries) above ``swaps`` above ``memory`` (host cache, pages, saved conversations) above
``state`` (the registry and its parts)."""
