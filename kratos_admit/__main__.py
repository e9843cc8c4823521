from kratos_admit.cli.main import run

run()
