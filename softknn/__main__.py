from softknn.cli import app

app(prog_name="softknn")
