"""Deploy: the jobs as data, run locally or as EMR steps, and the bundle EMR runs them from.

`jobs` turns a `lakehouse` command into a local spark-submit or an EMR step; `stream_target` is the
interface of the stream's supervision (its actions), which `stream_local` and `stream_emr` implement
on either target; `package` builds the EMR code bundle; `jvm_archive` the class archive local Spark
JVMs start from.
"""
