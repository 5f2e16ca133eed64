"""One typed, validated launch configuration from accordrun's arguments: ``LaunchConfig``,
horovodrun's flags and config file, the timeline path."""
