"""`softknn serve --ray`: the deployment (launcher) and its coordinator; import the modules themselves
(nothing is re-exported here, so importing the package loads neither Ray nor the app)."""
