"""The CLI as a script: `python -m pipelines.cli`, and the `cli.py` that EMR steps and spark-submit run."""

from pipelines.cli import main

if __name__ == "__main__":
    main()
