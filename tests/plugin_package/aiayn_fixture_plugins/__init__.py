"""aiayn plug-ins from outside aiayn: the `plain_softmax` kernel and the `log_distance`
position scheme, each a module that registers itself when its entry point is loaded."""
