from kratos_admit.cli import run

run()
