"""`ardiff serve`'s library: live sessions over one runner, and the HTTP/WebSocket app.

    manager = SessionManager.build(config)        # ardiff.serve.manager
    app = create_app(manager, token="...")        # ardiff.serve.app (FastAPI; the serve extra)

A layer above `ardiff.launch`, below the CLI (docs/design.md#12-serving). It never prints or
exits; the command (`ardiff_cli.serve`) binds the port and runs uvicorn.
"""
