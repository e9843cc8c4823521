"""kratos-admit: one module per command group, wiring arguments to the layers below; may import any layer, and only it loads the controller."""
