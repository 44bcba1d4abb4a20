"""The one wire: every request specadapt sends to a server goes through this package."""
