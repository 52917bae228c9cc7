"""The steps of one proxied request, in the order ``ProxyEndpoint`` (swapgate/proxy/handler.py)
calls them: admit (admit.py), place and send with the retry rule (send.py), pass the answer on
(answer.py); a request's one fallback model (fallback_models.py) is asked by the first two."""
