"""In-process fakes of the external services Kaiwa talks to, speaking their real wire protocols."""
