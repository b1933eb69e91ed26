"""The research record: study v1 (report and records) and study v2
(protocol, driver, analysis, records, report); README.md says which is
where."""
