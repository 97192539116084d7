"""Static analysis shared by `convert` and `check`: never imports or runs the user's code."""
