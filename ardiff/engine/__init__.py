"""The engine: loader and build (config -> runner), device, runner, sessions, timing."""
