"""Memory outside the engines: weights kept in the page cache (host cache, pages) and
conversations' KV saved across swaps."""
