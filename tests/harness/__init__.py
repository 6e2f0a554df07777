"""The checking machinery: plugin, case files, diagnosis, reports, campaigns, bench, mutation runner."""
