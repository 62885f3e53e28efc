"""The service's web pages: the history for people, with plots (kernelloop.server.web.pages)."""
