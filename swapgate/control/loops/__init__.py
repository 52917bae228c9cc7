"""What runs on a timer: the poller, preloads and their scheduler, the demand forecast, the decay
watch and its probe."""
