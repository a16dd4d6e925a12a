"""What every job runs on: settings, the console and log files, local processes, the Spark session
and its configuration, the Hudi write client's options, and the code archive a cluster imports.
"""
