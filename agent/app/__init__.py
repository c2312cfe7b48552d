"""The application: command line and commands, settings, the one configuration loader, reload,
assembly, the HTTP server."""
